"""python -m autoteardown doctor | demo"""

import sys

USAGE = """usage: python -m autoteardown COMMAND
  doctor   versions found, which integrations would patch, the config in effect
  demo     run a tiny verl-shaped job without and with the shim, side by side"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else ""
    if command == "doctor":
        from .doctor import doctor

        return doctor()
    if command == "demo":
        from .demo import demo

        return demo(argv[1:])
    print(USAGE, file=sys.stderr)
    return 0 if command in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
