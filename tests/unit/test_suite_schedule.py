"""How `make test` splits the suite over its workers (tests/conftest.py): a file is one unit of
work, the fault matrix's cells one unit, and the tiers that time elections and failovers one unit
together."""
from tests.conftest import SERIAL_TIERS, unit_of_work


def test_a_file_is_one_unit_and_the_timing_tiers_two():
    assert unit_of_work("tests/unit/test_wire.py::test_x[a-b]") == "tests/unit/test_wire.py"
    assert unit_of_work("tests/compat/test_cpp_client.py::test_y") == "tests/compat/test_cpp_client.py"
    assert unit_of_work("tests/chaos/test_f.py::test_z") == "serial-chaos"
    assert {unit_of_work(f"tests/{tier}/test_f.py::test_z") for tier in ("dledger", "ha", "faults")} \
        == {"serial-replication"}
    assert set(SERIAL_TIERS) == {"chaos", "dledger", "ha", "faults"}
    # two workers: the timing tiers are one unit beside the lighter files
    assert {unit_of_work(f"tests/{tier}/test_f.py::test_z", 2) for tier in SERIAL_TIERS} == {"serial-tiers"}
    assert unit_of_work("tests/unit/test_wire.py::test_x", 2) == "tests/unit/test_wire.py"
    # a directory that only starts like a tier is not one
    assert unit_of_work("tests/hazard/test_f.py::t") == "tests/hazard/test_f.py"
