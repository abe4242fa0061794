"""The clients (Python, C++, Node, the command line, grpcurl and buf curl)
against the real server, and their packages."""
