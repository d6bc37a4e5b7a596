"""benchmarks.network without timing a network: the breakdown's kinds, the command line's flags,
the folded ResNeXt-50 and the user-style import of a PyTorch module."""

import numpy as np
import pytest

from benchmarks import cli, network


@pytest.mark.parametrize("symbol, kind", [
    ("mk_conv2d_direct_n1c64h56w56_o64k1x1s1x1p0x0x0x0d1x1g1_bias_relu", "conv"),
    ("mk_conv2d_wino4_input_transform", "conv"),
    ("mk_qconv2d_3_mk_u8s8_gemm_8x48_avx512vnni", "conv"),  # our int8 conv of a QDQ conv (relax/int8.py)
    ("mk_fused_matmul_add", "ours (other ops)"),  # a matmul rest.py scheduled
    ("mk_matmul_m3136n384k96_bias", "matmul"),  # a Linear layer on our packed matmul
    ("mk_mean", "ours (other ops)"),
    ("mk_te_layout_transform3", "layout transforms"),
    ("fused_layout_transform1", "layout transforms"),
    ("fused_batch_norm_relu", "TVM lowering"),
    ("max_pool2d", "TVM lowering"),
    # a conv our pass left to TVM is TVM's loop nest, even once schedule_rest has vectorized it
    ("conv2d", "conv (TVM's lowering)"),
    ("mk_fused_conv2d1_add_relu", "conv (TVM's lowering)"),
])
def test_classify(symbol, kind):
    assert network.classify(symbol) == kind


def test_breakdown_sums_by_kind():
    got = network.breakdown({"mk_conv2d_a": 1.0, "mk_conv2d_b": 2.0, "mk_mean": 0.5, "te_layout_transform": 0.25,
                             "fused_add": 0.125})
    assert got == {"conv": 3.0, "ours (other ops)": 0.5, "layout transforms": 0.25, "TVM lowering": 0.125}


def test_cli_accepts_the_network_flags():
    args = cli.parser().parse_args(["bench", "resnext50", "--style", "both", "--peers", "--batch", "1", "8",
                                    "--threads", "2", "--repeat", "3"])
    assert (args.what, args.style, args.peers, args.batch, args.threads) == ("resnext50", "both", True, [1, 8], [2])
    assert args.tvm_default is None  # main: TVM's default build unless --peers
    assert cli.parser().parse_args(["bench", "resnet50", "--no-default"]).tvm_default is False
    args = cli.parser().parse_args(["bench", "mobilenet_v2", "--peers", "--default"])
    assert args.tvm_default is True and args.style == "folded" and args.batch == [1]
    assert cli.parser().parse_args(["bench", "resnet50", "--autotune"]).autotune is True
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["bench", "resnet50", "--style", "nope"])


def test_folded_resnext50_has_grouped_3x3s():
    from models import resnet

    net = resnet.resnext50_32x4d()
    grouped = [c for c in net.convs if c.groups > 1]
    assert len(grouped) == 16 and {c.groups for c in grouped} == {32}
    assert {c.cin // c.groups for c in grouped} == {4, 8, 16, 32}
    assert net.features == 2048 and len(net.convs) == 53
    assert resnet.resnet().convs == [c for c in resnet.resnet(groups=1, base_width=64).convs]


def test_user_style_import_runs_through_optimize():
    """A PyTorch module with a batch norm, imported the way `--style user` does it, optimized and run:
    the torch frontend's tuple output, the conv on our kernel."""
    torch = pytest.importorskip("torch", reason="--style user imports a PyTorch module")
    import tvm
    from torch import nn

    from schedules import relax as mkrelax

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()).eval()
    x = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype(np.float32)
    report: list = []
    mod = mkrelax.optimize(network.import_torch(model, x), "native", report=report)
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target=mkrelax.llvm_target("native")), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x))[0].numpy()  # the torch frontend's main returns a tuple
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert [r["runs_on"] for r in report if r.get("op", "conv2d") == "conv2d"] == ["ours"]
