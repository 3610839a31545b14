"""One engine instance: request state, paged KV bookkeeping, the scheduler, executors and models."""
