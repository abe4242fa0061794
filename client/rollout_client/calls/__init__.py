"""How a call reaches the server and what it sends, for every RPC and both
clients: channels, auth, TLS and the retry policy, and the error both clients
raise (connection.py); the generate options and their one request builder
(generate_request.py); the other requests, readiness and error translation
(core.py); a completion's weight version per token (versions.py)."""
