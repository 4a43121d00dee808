import pytest

from herder.config.definition import InvalidConfiguration
from herder.runtime.instance_ids import MAX_LENGTH, invalid_reason, sink_task_instance_id
from herder.runtime.worker_config import WORKER_CONFIG, WorkerConfig

pytestmark = pytest.mark.unit


def test_a_worker_is_dynamic_unless_given_an_instance_id() -> None:
    assert WorkerConfig.from_properties({"group.id": "g"}).group_instance_id is None
    config = WorkerConfig.from_properties({"group.id": "g", "group.instance.id": "worker-1.a_b"})
    assert config.group_instance_id == "worker-1.a_b"
    assert WORKER_CONFIG.keys["group.instance.id"].documentation


@pytest.mark.parametrize(
    ("instance_id", "reason"),
    [
        ("", "non-empty"),
        ("x" * (MAX_LENGTH + 1), "at most 249"),
        ("worker 1", "only ASCII letters"),
        ("worker/1", "only ASCII letters"),
        ("wörker", "only ASCII letters"),
    ],
)
def test_an_illegal_instance_id_is_refused_naming_the_key(instance_id: str, reason: str) -> None:
    with pytest.raises(InvalidConfiguration) as caught:
        WorkerConfig.from_properties({"group.id": "g", "group.instance.id": instance_id})
    assert "group.instance.id" in str(caught.value)
    assert reason in str(caught.value)


def test_the_longest_legal_instance_id_is_accepted() -> None:
    config = WorkerConfig.from_properties({"group.id": "g", "group.instance.id": "x" * MAX_LENGTH})
    assert config.group_instance_id == "x" * MAX_LENGTH


def test_a_sink_task_id_names_worker_connector_and_task() -> None:
    assert sink_task_instance_id("w1", "orders-sink", 3) == "w1-orders-sink-3"
    # stable: the same on every restart of the worker
    assert sink_task_instance_id("w1", "orders-sink", 3) == sink_task_instance_id(
        "w1", "orders-sink", 3
    )


def test_sink_task_ids_differ_between_tasks_and_between_workers() -> None:
    ids = {
        sink_task_instance_id(worker, connector, task)
        for worker in ("w1", "w2")
        for connector in ("a", "b")
        for task in range(3)
    }
    assert len(ids) == 12


@pytest.mark.parametrize(
    ("worker", "connector"),
    [
        ("w1", "my sink/connector"),
        ("w" * MAX_LENGTH, "sink"),
        ("w1", "s" * 400),
        ("w1", "ünïcode sink"),
    ],
)
def test_a_derived_id_is_always_legal(worker: str, connector: str) -> None:
    derived = sink_task_instance_id(worker, connector, 12)
    assert invalid_reason(derived) is None
    assert len(derived) <= MAX_LENGTH


def test_names_that_differ_only_where_replaced_or_cut_still_get_different_ids() -> None:
    assert sink_task_instance_id("w1", "a b", 0) != sink_task_instance_id("w1", "a/b", 0)
    long = "s" * 300
    assert sink_task_instance_id("w1", long + "x", 0) != sink_task_instance_id("w1", long + "y", 0)
    assert sink_task_instance_id("w1", long, 0) != sink_task_instance_id("w1", long, 1)
