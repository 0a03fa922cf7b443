"""The reference's learning rate: linear warmup from start_warmup_step, then polynomial decay."""


def learning_rate(step, init_lr, num_train_steps, num_warmup_steps, start_warmup_step=0, poly_power=1.0):
    """Learning rate at global (micro-)step ``step``, as the reference computes it.

    Poly decay to 0 at ``num_train_steps`` (the step is capped there); while
    ``step - start_warmup_step < num_warmup_steps`` the warmup value
    ``init_lr * (step - start_warmup_step) / num_warmup_steps`` replaces it.

    In float32, with the reference graph's operations (its optimization.py as TF runs it): TF's
    graph optimizer (grappler's constant folding, ReduceDivToReciprocalMul) turns each division by
    a constant step count into a product with its float32 reciprocal, and folds init_lr into the
    warmup's. Float64 arithmetic gave another float32 at about half the steps (1 ulp).
    """
    from numpy import float32 as f32, power  # here: run_config imports this module under python -S
    init = f32(init_lr)
    s = min(f32(step), f32(num_train_steps))
    lr = init * power(f32(1) - s * (f32(1) / f32(num_train_steps)), f32(poly_power))
    if num_warmup_steps:
        done = step - start_warmup_step
        if done < num_warmup_steps:
            lr = init * (f32(1) / f32(num_warmup_steps)) * f32(done)
    return float(lr)
