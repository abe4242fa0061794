"""The update path, in the server process: staged sessions, the assembler that
validates bytes into the staging region, the one quiesce every update, LoRA
change and sleep enters, and the updater that applies them to the engine."""
