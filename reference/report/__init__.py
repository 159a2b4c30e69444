"""Step 4, the report: what a load did, as values (`summary`), and the process memory it took
as Linux reports it (`memory`)."""

__all__: list[str] = []
