"""`python -m rollout_client.load [locust's flags and ours]`: Locust on this
package's locustfile, in place of this process. `--locustfile` alone prints
the file's path instead, for `locust -f "$(python -m rollout_client.load --locustfile)"`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--locustfile"]:
        print(LOCUSTFILE)
        return
    # Locust's own `python -m locust`, so that its gevent patching comes first.
    cmd = [sys.executable, "-m", "locust", "-f", os.fspath(LOCUSTFILE), *args]
    os.execv(sys.executable, cmd)


if __name__ == "__main__":
    main()
