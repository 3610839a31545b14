"""The performance model: how long a batch takes on this hardware and model, fitted from
measured steps, and the predictor the scheduling policies ask ("how long would this
batch run?", "when would this request's prefill finish?"). It decides nothing itself."""
