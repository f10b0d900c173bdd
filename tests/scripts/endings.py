"""How a script under tests/scripts ends, by name: normal, raise, exit3, interrupt, or
sigterm (prints READY and waits for the test's signal). Called at a script's top level,
so what it raises leaves __main__ as the script's own would."""

import sys
import time


def end(ending):
    if ending == "raise":
        raise ValueError("the user's own error")
    if ending == "exit3":
        sys.exit(3)
    if ending == "interrupt":
        raise KeyboardInterrupt
    if ending == "sigterm":
        print("READY", flush=True)
        while True:
            time.sleep(0.1)
