"""tests/durations.py: the slowest tests of a run's --durations output, keyed as the ordering hook looks them up."""

from tests.durations import parse

LOG = """
============================= slowest durations ==============================
53.20s setup    tests/trainer/engines/vllm/test_vllm.py::test_sampled[0.7]@vllm
2.60s call     tests/trainer/engines/vllm/test_vllm.py::test_sampled[0.7]@vllm
6.00s call     tests/envs/test_a.py::test_b[x@y]
4.90s call     tests/envs/test_a.py::test_quick
"""


def test_phases_add_up_and_the_group_suffix_is_dropped():
    assert parse(LOG) == {
        "tests/trainer/engines/vllm/test_vllm.py::test_sampled[0.7]": 55.8,  # plain_id() strips `@vllm` the same way
        "tests/envs/test_a.py::test_b[x@y]": 6.0,  # an `@` inside a parameter id stays
    }  # under 5 s: left where collection puts it
