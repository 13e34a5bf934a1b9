"""CLI sub-commands, one per module; each module exposes ``command`` (a click.Command)."""
