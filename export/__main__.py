from export.cli import run

run()
