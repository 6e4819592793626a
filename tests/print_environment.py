"""``python -m tests.print_environment NAME``: the variable NAME of this process's environment on
stderr (``<unset>`` without it); a child process's view of the environment it was given."""

import os
import sys

print(os.environ.get(sys.argv[1], "<unset>"), file=sys.stderr)
