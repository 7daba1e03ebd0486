"""`python -m kata.ring`: the ring launcher of kata/tools/ring.py under the short name the README gives."""
import sys

from kata.tools.ring import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
