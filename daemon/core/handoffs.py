"""The controller core's P/D hand-off (docs/design.md §5.9): the component that passes a
prefill instance's request on to a decode instance with its KV. Sans-I/O, like the core.

A `Handoff` comes after the StepOutputs that carried the request's first token (one
instance's messages arrive in order), so the request is STREAMING. The component picks
the decode instance (`policies.decode_choice`) and sends it a `SubmitPrefilled`; the KV
frames are the driver's to carry (they never enter the core). With no decode instance
ready, the request is treated as one whose instance died: resumed by recompute wherever
recovery places it (daemon/core/recovery.py).
"""
from __future__ import annotations

from daemon.core.events import Action, Send
from daemon.core.ledger import InstanceView, Ledger
from daemon.core.recovery import Recovery
from daemon.core.request_state import Tracked, Trigger
from ipc.messages import Handoff, Role, SubmitPrefilled
from policies.decode_choice import DecodeView, choose_decode


class Handoffs:
    def __init__(self, ledger: Ledger, recovery: Recovery) -> None:
        self.ledger = ledger
        self.recovery = recovery

    def handed_off(self, now: float, view: InstanceView, message: Handoff,
                   out: list[Action]) -> None:
        ledger = self.ledger
        tracked = ledger.held(message.request_id, view)
        if tracked is None:
            return  # the client left meanwhile: its KV is dropped with the message
        target = choose_decode(self._decode_views(), len(message.token_ids))
        if target is None:
            self.recovery.lose(now, [tracked], "no decode instance was ready to take it over "
                                               f"from prefill instance {view.instance_id}", out)
            return
        tracked.advance(Trigger.HANDED_OFF)
        ledger.hand_off(tracked, target)
        out.append(Send(target, SubmitPrefilled(
            submit=tracked.submit, token_ids=message.token_ids,
            num_computed_tokens=message.num_computed_tokens, kv=message.kv)))

    def _decode_views(self) -> list[DecodeView]:
        """Every ready decode instance, with the context its requests hold in its KV."""
        ledger, views = self.ledger, []
        for i in ledger.ready_ids():
            if ledger.role_of[i] is not Role.DECODE:
                continue
            instance = ledger.instances[i]
            tokens = sum(self._context_tokens(t) for t in instance.held.values())
            capacity = instance.ready.num_kv_blocks * instance.ready.block_size
            views.append(DecodeView(i, tokens, capacity, len(instance.held)))
        return views

    @staticmethod
    def _context_tokens(tracked: Tracked) -> int:
        return len(tracked.original.prompt_token_ids) + len(tracked.token_ids)
