"""A stand-in for the Ray relay's transport (send, request_count) that records what a verl loop
reports: shared by the integration tests of the hook, unit and system."""

from __future__ import annotations

from esiwrap.trainer import wire


class RecordingTransport:
    """The relay's interface (send, request_count), recording what the loop reports."""

    def __init__(self, requests: int = 0) -> None:
        self.requests = requests
        self.sent: list[wire.Message] = []

    def send(self, message: wire.Message) -> bool:
        wire.encode(message, 1)  # what esiwrap could decode
        self.sent.append(message)
        return True

    def request_count(self) -> int:
        return self.requests

    def types(self) -> list[str]:
        return [wire.type_of(message) for message in self.sent]
