"""Real NCCL peers on one GPU: the environment that makes several processes distinct NCCL hosts sharing
the one visible GPU (docs/real-peers.md). The same settings as `gtp-launch --share-gpu`
(comm/launcher.h, shared_gpu_environment); a test checks that the two agree.

NCCL then connects the ranks with its socket transport over loopback and time-slices their kernels on
the GPU: every collective, abort and ordering is NCCL's own, but timings mean nothing. Apply it in
each rank's process before NCCL initialises (before torch.distributed.init_process_group("nccl") or a
libgtp context on the CUDA backend)."""
import os

LAUNCH_ID_VARIABLE = "GTP_SHARED_GPU_LAUNCH"


def environment(rank, launch_id):
    """The variables rank `rank` of launch `launch_id` needs (every value a str)."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"rank {rank!r}: pass the process's rank, an int >= 0")
    if not launch_id or not str(launch_id).replace("-", "").isalnum():
        raise ValueError(f"launch_id {launch_id!r}: pass letters, digits and '-' that name this job "
                         "(e.g. the launcher's pid), so two jobs on one machine never share an NCCL host id")
    return {"NCCL_HOSTID": f"gtp-shared-gpu-{launch_id}-rank{rank}", "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "LOCAL_RANK": "0", "GTP_LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "GTP_SHARED_GPU": "1"}


def apply(rank, launch_id):
    """Sets environment(rank, launch_id) in this process (replacing values already there)."""
    os.environ.update(environment(rank, launch_id))


def active():
    """Whether this process is one of several ranks sharing one GPU (its timings mean nothing)."""
    return os.environ.get("GTP_SHARED_GPU") == "1"


def device_index(rank, device_count):
    """The CUDA device rank `rank` uses: 0 when sharing one GPU, else one GPU per rank."""
    if active():
        return 0
    if rank >= device_count:
        raise ValueError(f"rank {rank} needs GPU {rank} but {device_count} are visible: give each rank a GPU, "
                         "or run the ranks as real peers on one GPU (gtp.shared_gpu, gtp-launch --share-gpu)")
    return rank
