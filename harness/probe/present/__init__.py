"""What a probe found, for people: its tables, the axes it covered and the labels it could not measure, and why."""
