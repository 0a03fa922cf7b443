"""The reference's learning rate: linear warmup from start_warmup_step, then polynomial decay."""


def learning_rate(step, init_lr, num_train_steps, num_warmup_steps, start_warmup_step=0, poly_power=1.0):
    """Learning rate at global (micro-)step ``step``, as the reference computes it.

    Poly decay to 0 at ``num_train_steps`` (the step is capped there); while
    ``step - start_warmup_step < num_warmup_steps`` the warmup value
    ``init_lr * (step - start_warmup_step) / num_warmup_steps`` replaces it.
    """
    s = min(step, num_train_steps)
    lr = init_lr * (1.0 - s / num_train_steps) ** poly_power
    if num_warmup_steps:
        done = step - start_warmup_step
        if done < num_warmup_steps:
            lr = init_lr * done / num_warmup_steps
    return lr
