"""Pure planning functions: they take data and return numbers, never touching clocks or files."""
