"""How `make test` splits the suite over its two workers (tests/conftest.py): a file is one unit
of work, and the tiers that time failovers and faults are one unit together."""
from tests.conftest import SERIAL_TIERS, unit_of_work


def test_a_file_is_one_unit_and_the_timing_tiers_one_together():
    assert unit_of_work("tests/unit/test_wire.py::test_x[a-b]") == "tests/unit/test_wire.py"
    assert unit_of_work("tests/compat/test_cpp_client.py::test_y") == "tests/compat/test_cpp_client.py"
    serial = {unit_of_work(f"tests/{tier}/test_f.py::test_z") for tier in SERIAL_TIERS}
    assert serial == {"serial-tiers"}
    assert set(SERIAL_TIERS) == {"chaos", "dledger", "ha", "faults"}
    # a directory that only starts like a tier is not one
    assert unit_of_work("tests/hazard/test_f.py::t") == "tests/hazard/test_f.py"
