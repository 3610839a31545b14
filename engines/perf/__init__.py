"""The performance model: how long a batch takes on this hardware and model, fitted from
measured steps (model.py). It decides nothing itself, so it lives with the engines that
measure and use it, not with the policies: they ask it through the `Predictor` protocol
(policies/predictor.py) and never import it, which keeps policies/ at the bottom layer
(engines/ import policies/, never the reverse)."""
