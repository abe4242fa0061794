"""Weight updates from the client's side: the options of update_weights
(update_options.py); the update checked against the served manifest
(manifest.py), made ready to send and sent again after UNAVAILABLE
(updates.py); sent over one stream, parallel uploads or the same-host handoff
(push.py; push_async.py under asyncio); interrupted with an answer on whether
its commit was sent (interrupts.py); and sent as a delta against what this
client pushed last (delta_push.py) when what earlier pushes measured says it
is cheaper (delta_costs.py)."""
