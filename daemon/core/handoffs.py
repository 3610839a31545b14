"""The controller core's P/D hand-off: a prefill instance's request goes on to a decode
instance with its KV (a mixin of `ControllerCore`, which owns the state; sans-I/O like it).

A `Handoff` comes after the StepOutputs that carried the request's first token (one
instance's messages arrive in order), so the request is STREAMING. The core picks the
decode instance (`policies.decode_choice`) and sends it a `SubmitPrefilled`; the KV
frames are the driver's to carry (they never enter the core). With no decode instance
ready, the request is treated as one whose instance died: resumed by recompute wherever
recovery places it (daemon/core/recovery.py).
"""
from __future__ import annotations

from daemon.core.events import Action, Send
from daemon.core.request_state import Trigger
from ipc.messages import Handoff, Role, SubmitPrefilled
from policies.decode_choice import DecodeView, choose_decode


class Handoffs:
    def _handed_off(self, now: float, view, message: Handoff, out: list[Action]) -> None:
        tracked = self._held(message.request_id, view)
        if tracked is None:
            return  # the client left meanwhile: its KV is dropped with the message
        target = choose_decode(self._decode_views(), len(message.token_ids))
        if target is None:
            self._lose(now, [tracked], "no decode instance was ready to take it over from "
                                       f"prefill instance {view.instance_id}", out)
            return
        self._release(tracked)
        tracked.advance(Trigger.HANDED_OFF)
        tracked.instance = target
        self.instances[target].held[tracked.request_id] = None
        out.append(Send(target, SubmitPrefilled(
            submit=tracked.submit, token_ids=message.token_ids,
            num_computed_tokens=message.num_computed_tokens, kv=message.kv)))

    def _decode_views(self) -> list[DecodeView]:
        """Every ready decode instance, with the context its requests hold in its KV."""
        views = []
        for i in self.ready_ids():
            if self.roles[i] is not Role.DECODE:
                continue
            instance = self.instances[i]
            tokens = sum(self._context_tokens(r) for r in instance.held)
            capacity = instance.ready.num_kv_blocks * instance.ready.block_size
            views.append(DecodeView(i, tokens, capacity, len(instance.held)))
        return views

    def _context_tokens(self, request_id: str) -> int:
        tracked = self.requests[request_id]
        return len(tracked.original.prompt_token_ids) + len(tracked.token_ids)
