"""The tables the GPU tests print, kept for a file: ``$GPU_SUMMARY``, when set, receives a
module's rows (appended at its teardown, or written by its last test)."""

import os


class Rows:
    """One module's printed rows."""

    def __init__(self):
        self.lines = []

    def note(self, line=""):
        print(line)
        self.lines.append(line)

    def write(self, mode="a"):
        path = os.environ.get("GPU_SUMMARY")
        if path:
            with open(path, mode) as f:
                f.write("\n".join(self.lines) + "\n")
