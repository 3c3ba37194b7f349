"""What the bench writes: a run's results.json, results.md and chart.png (`outputs`), and bench/README.md's result
tables from the record under bench/results/ (`readme_tables`)."""
