import logging

from accel.vllm.platform import choose_platform, effective_tensor_parallel_size, has_tpu_chips


def test_tpu_host_left_to_vllm():
    env = {}
    choice = choose_platform(env, has_tpu=True, libtpu_installed=True)
    assert choice.is_tpu and env == {}


def test_libtpu_without_chips_forces_cpu(caplog):
    env = {}
    with caplog.at_level(logging.WARNING, logger="accel.vllm.platform"):
        choice = choose_platform(env, has_tpu=False, libtpu_installed=True)
    assert choice.name == "cpu" and choice.is_forced_cpu
    assert env == {"VLLM_TARGET_DEVICE": "cpu", "JAX_PLATFORMS": "cpu"}
    assert "forcing the CPU build" in caplog.text


def test_plain_cpu_host():
    env = {}
    choice = choose_platform(env, has_tpu=False, libtpu_installed=False)
    assert choice.name == "cpu" and not choice.is_forced_cpu
    assert env == {"VLLM_TARGET_DEVICE": "cpu"}


def test_explicit_cpu_target_wins_on_tpu_host():
    env = {"VLLM_TARGET_DEVICE": "cpu"}
    assert choose_platform(env, has_tpu=True, libtpu_installed=True).name == "cpu"


def test_tp_mapping(caplog):
    tpu = choose_platform({}, has_tpu=True, libtpu_installed=True)
    cpu = choose_platform({}, has_tpu=False, libtpu_installed=False)
    assert effective_tensor_parallel_size(None, 16, tpu) == 16
    assert effective_tensor_parallel_size(4, 16, tpu) == 4
    with caplog.at_level(logging.INFO, logger="accel.vllm.platform"):
        assert effective_tensor_parallel_size(None, 16, cpu) == 1
        assert effective_tensor_parallel_size(8, 16, cpu) == 1
    assert "CPU stand-in runs TP=1" in caplog.text


def test_tpu_probe(tmp_path):
    assert not has_tpu_chips(tmp_path)
    dev = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:04.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1ae0\n")
    assert has_tpu_chips(tmp_path)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "accel0").touch()
    assert has_tpu_chips(tmp_path)


def test_torch_tpu_not_autoloaded_by_the_cpu_stand_in():
    env = {}
    choose_platform(env, has_tpu=False, libtpu_installed=True, torch_tpu_installed=True)
    assert env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    tpu_env = {}
    choose_platform(tpu_env, has_tpu=True, libtpu_installed=True, torch_tpu_installed=True)
    assert tpu_env == {}  # on TPU torch-tpu must load
