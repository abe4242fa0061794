"""The generation pipeline: one generation (or session turn) from its
caller's slot to its outputs, written once and called by every front (the
gRPC handlers in rpc/ today). Nothing here imports gRPC."""
