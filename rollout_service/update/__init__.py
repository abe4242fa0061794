"""The update path, in the server process: one update as a chain of values
(a plan, the received update, an applier: updates.py draws it), the staged
sessions that drive it, and the one quiesce every update, LoRA change, cache
reset and sleep enters."""
