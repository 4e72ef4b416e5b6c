"""Tables, JSON/CSV, plots and statistics. Knows nothing of the kernel."""
