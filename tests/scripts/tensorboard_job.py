"""An unmodified script that logs 100 scalars to a SummaryWriter (flush_secs=120) and
just ends. Usage: tensorboard_job.py LOGDIR MODE [tensorboardX]
  open    never calls close()
  closed  calls close() itself

The atexit hook is registered after the writer is made, so it runs after
autoteardown's exit hook (which comes before any atexit callback) and reports
whether the writer was closed by then."""

import atexit
import sys

if sys.argv[3:] == ["tensorboardX"]:
    from tensorboardX import SummaryWriter
else:
    from torch.utils.tensorboard import SummaryWriter

logdir, mode = sys.argv[1:3]
writer = SummaryWriter(log_dir=logdir, flush_secs=120)


def report():
    # close() drops the writer's file writers (torch 2.13; tensorboardX 2.x too).
    print(f"AT EXIT: closed={writer.all_writers is None}", flush=True)


atexit.register(report)
for step in range(100):
    writer.add_scalar("loss", 1.0 / (step + 1), step)
print("LOGGED 100", flush=True)
if mode == "closed":
    writer.close()
