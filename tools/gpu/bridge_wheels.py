"""The wheels Megatron Bridge 0.6.2's GPU run needs on the GPU machine (Python 3.12, torch, no network;
TE and Megatron-Core come from the runner's own staging): `stage` downloads them here (pinned in
tools/constraints-bridge.txt, cp312 / py3-none) and unpacks each into FOLDER/<distribution>/, which
stage.sh packs (xz compresses the sources about twice as well as the wheels' zip); `unpack` runs
there and copies a distribution only when the machine lacks its packages, so the image's own win.
Left out: tensorboard/webfiles.zip (4.3 MB, the TensorBoard server's web frontend; Bridge imports
tensorboard only through torch.utils.tensorboard's SummaryWriter, which never reads it).

Chosen by importing Bridge as bench/bridge/bridge_gpu.py does, in a Python 3.12 environment holding
only what the GPU machine has (torch and its dependencies, numpy, packaging, the TE bundle's deps,
Megatron-Core, psutil) plus these wheels. Bridge imports far more at load (every Hugging Face model
bridge, SFT and VLM data): those packages are never used by the run and are replaced by named test
doubles (bench/bridge/import_doubles.py, NAMES), which fail the run if anything calls them.

    python3 tools/gpu/bridge_wheels.py stage DIR      (here; needs network)
    python3 tools/gpu/bridge_wheels.py unpack DIR TARGET   (on the GPU machine)"""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

# distribution: the top-level modules whose absence means the wheel is unpacked
WHEELS = {
    "megatron-bridge": ["megatron.bridge"],
    "nvidia-resiliency-ext": ["nvidia_resiliency_ext"],   # Bridge imports its inprocess package at load
    "nvidia-modelopt": ["modelopt"],                      # train_step calls its distillation shape hook
    "PuLP": ["pulp"], "orloge": ["orloge"], "cpsat-logutils": ["cpsat_logutils"],  # modelopt's imports
    "regex": ["regex"],                                   # modelopt.torch.quantization
    "requests": ["requests"], "urllib3": ["urllib3"], "idna": ["idna"], "certifi": ["certifi"],  # modelopt utils
    "omegaconf": ["omegaconf"], "PyYAML": ["yaml"],       # Bridge's config containers (YAML round trip)
    "rich": ["rich"], "tqdm": ["tqdm"], "defusedxml": ["defusedxml"],
    "tensorboard": ["tensorboard"], "absl-py": ["absl"],  # torch.utils.tensorboard, imported by Bridge's state
}
LEFT_OUT = ("tensorboard/webfiles.zip",)
CONSTRAINTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "constraints-bridge.txt")


def pins():
    found = {}
    for line in open(CONSTRAINTS):
        name, _, version = line.strip().partition("==")
        if version and not name.startswith("#"):
            found[name.lower()] = version
    missing = [d for d in WHEELS if d.lower() not in found]
    if missing:
        raise SystemExit(f"bridge_wheels: {missing} not pinned in tools/constraints-bridge.txt: pin them there")
    return {d: found[d.lower()] for d in WHEELS}


def stage(folder):
    os.makedirs(folder, exist_ok=True)
    downloads = tempfile.mkdtemp(prefix="bridge-wheels-")
    wanted = [f"{d}=={v}" for d, v in pins().items()]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--only-binary", ":all:", "--python-version", "3.12", "--implementation", "cp",
                    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_31_x86_64",
                    "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_39_x86_64", "-d", downloads, *wanted], check=True)
    wheels = sum(os.path.getsize(p) for p in glob.glob(os.path.join(downloads, "*.whl")))
    for dist in WHEELS:
        target = os.path.join(folder, dist)
        shutil.rmtree(target, ignore_errors=True)
        zipfile.ZipFile(_wheel_for(downloads, dist)).extractall(target)
        for name in LEFT_OUT:
            if os.path.exists(os.path.join(target, name)):
                os.remove(os.path.join(target, name))
    shutil.rmtree(downloads)
    print(f"bridge_wheels: {len(wanted)} wheels ({wheels / 2**20:.1f} MiB) unpacked into {folder}, less {', '.join(LEFT_OUT)}")


def _wheel_for(folder, dist):
    prefix = dist.replace("-", "_").lower() + "-"
    hits = [p for p in glob.glob(os.path.join(folder, "*.whl")) if os.path.basename(p).lower().startswith(prefix)]
    if not hits:
        raise SystemExit(f"bridge_wheels: pip downloaded no wheel of {dist} into {folder}")
    return hits[0]


def unpack(folder, target):
    os.makedirs(target, exist_ok=True)
    done = []
    for dist, modules in WHEELS.items():
        def present(name):
            try:
                return importlib.util.find_spec(name) is not None
            except ModuleNotFoundError:
                return False
        if all(present(m) for m in modules):
            continue
        source = os.path.join(folder, dist)
        if not os.path.isdir(source):
            raise SystemExit(f"bridge_wheels: {source} is not staged (run tools/gpu/stage.sh again)")
        shutil.copytree(source, target, dirs_exist_ok=True)
        done.append(dist)
    print(f"bridge_wheels: unpacked into {target}: {', '.join(done) or 'nothing (all present)'}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "stage":
        stage(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "unpack":
        unpack(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
