"""The sessions module's server (conftest's `sessions_server`): bearer
tokens (tests/support/tokens.py), small session bounds, and the embedded
model's chat template changed to drop the reasoning of earlier assistant
messages, as Qwen3's does (the template rule's hostile case), and to render
tool calls and tool results' call ids (the embedded one ignores both)."""

from __future__ import annotations

from pathlib import Path

from tests.support.tokens import ADMIN, GENERATE, GENERATE_B

# rollout_service.engine.tiny_models' template, with the reasoning of every
# assistant message but the last dropped, and tool calls (their arguments as
# JSON) and a tool result's call id rendered.
THINK_STRIPPING = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'assistant' and not loop.last %}"
    "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}"
    "{% for c in m['tool_calls'] or [] %}<call>{{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}</call>{% endfor %}"
    "{% if m['tool_call_id'] %}[{{ m['tool_call_id'] }}]{% endif %}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MAX_PER_CALLER = 3
IDLE_SECONDS = 8


def server_args(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    template = folder / "think-stripping.jinja"
    template.write_text(THINK_STRIPPING)
    tokens = folder / "tokens"
    tokens.write_text(f"admin:{ADMIN}\ngenerate:{GENERATE}\ngenerate:{GENERATE_B}\n")
    return [
        "--tokens-file",
        str(tokens),
        "--chat-template",
        str(template),
        "--max-sessions-per-caller",
        str(MAX_PER_CALLER),
        "--session-idle-timeout-seconds",
        str(IDLE_SECONDS),
    ]
