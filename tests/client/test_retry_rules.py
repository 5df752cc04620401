"""The retry and re-route rules on the error classes, shared by the durable connection
and the blocking client."""

from __future__ import annotations

import pytest

from client import errors
from client.errors import Retry, TandemError, for_code

ALL = [cls for cls in vars(errors).values()
       if isinstance(cls, type) and issubclass(cls, TandemError)]


@pytest.mark.parametrize("cls,retry", [
    (errors.NotActiveError, Retry.ASK_ACTIVE),
    (errors.UnavailableError, Retry.OTHER_NODE),
    (errors.ShuttingDownError, Retry.OTHER_NODE),
    (errors.ConnectionClosedError, Retry.NEW_LINK),
    (errors.HeartbeatTimeoutError, Retry.NEW_LINK),
    (errors.StorageError, Retry.SAME_NODE),
    (errors.OutOfOrderSequenceError, Retry.SAME_NODE),
    (errors.TimeoutError_, Retry.SAME_NODE),
    (errors.QueueFullError, Retry.FAIL),  # retriable on the wire, but back-pressure is the caller's
    (errors.BufferFull, Retry.FAIL),
    (errors.QueueNotFoundError, Retry.FAIL),
    (errors.AccessRefusedError, Retry.FAIL),
    (errors.MessageTooLargeError, Retry.FAIL),
    (errors.StaleDeliveryError, Retry.FAIL),
    (errors.ConfirmedMessagesLost, Retry.FAIL),
    (TandemError, Retry.FAIL),
])
def test_each_error_says_what_a_client_does_with_a_failed_request(cls: type[TandemError], retry: Retry) -> None:
    assert cls.retry is retry
    exc = cls("x")
    assert exc.should_retry is (retry is not Retry.FAIL)


@pytest.mark.parametrize("cls", ALL)
def test_only_a_retriable_error_is_ever_sent_again(cls: type[TandemError]) -> None:
    if cls.retry is not Retry.FAIL:
        assert cls.retriable


def test_reroute_means_ask_again_who_serves_it() -> None:
    rerouting = {cls for cls in ALL if cls("x").reroutes}
    assert rerouting == {errors.NotActiveError, errors.UnavailableError, errors.ShuttingDownError,
                         errors.ConnectionClosedError, errors.HeartbeatTimeoutError}


def test_the_rules_survive_the_wire() -> None:
    assert for_code(errors.ErrorCode.NOT_ACTIVE, "x", active_hint="n2").reroutes
    assert for_code(errors.ErrorCode.QUEUE_FULL, "x").retriable
    assert not for_code(errors.ErrorCode.QUEUE_FULL, "x").should_retry
    assert not for_code(999, "x").should_retry  # a code this build does not know: the caller hears it


def test_a_failed_settlement_redelivers_when_the_link_or_the_tag_is_gone() -> None:
    assert errors.ConnectionClosedError("x").redelivers
    assert errors.UnknownDeliveryTagError("x").redelivers
    assert errors.UnavailableError("x").redelivers
    assert not errors.AccessRefusedError("x").redelivers
    assert not errors.InvalidArgumentError("x").redelivers


def test_a_subscription_ends_for_good_only_when_its_queue_or_its_rights_are_gone() -> None:
    """... or it asks for a prefetch above the node's ceiling, or what it asks is refused as such
    (a stream is read, not consumed): asking again cannot help."""
    ending = {cls for cls in ALL if cls.ends_subscription}
    assert ending == {errors.QueueNotFoundError, errors.AccessRefusedError, errors.ConsumerCancelledError,
                      errors.PrefetchTooLargeError, errors.InvalidArgumentError}
