"""The integrations, and the imports that trigger them.

Each integration is a module here with the same contract (as in ddtrace):
`patch()` (idempotent; patches what is imported now), `unpatch()`, and
`get_version()`. Its module is imported only when one of its target modules
is, through the post-import hooks set up by `autoteardown.install()`.
"""

TRIGGERS = {
    "torch": ("torch.utils.data", "torchdata.stateful_dataloader"),
    "wandb": ("wandb",),
    "ray": ("ray",),
}


def hook_name(integration):
    return f"autoteardown.integrations.{integration}:patch"
