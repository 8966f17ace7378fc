"""The CRI API as Python gRPC stubs, generated at set-up time and cached by version.

The proto comes from the Go module `k8s.io/cri-api` through the Go module proxy
(`go mod download`); older releases import gogo protos, whose imports and options are stripped
so `grpc_tools.protoc` compiles it alone.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from e2e.harness.cri.cache import BuildError, cached_entry, run
from e2e.harness.tools.gotools import GoToolsError, go_binary, go_env

CRI_API_MODULE = "k8s.io/cri-api"
CRI_API_VERSION = "v0.37.2"
PROTO_IN_MODULE = "pkg/apis/runtime/v1/api.proto"
# Not `api.proto`: the generated modules are imported by this name and must not collide.
PROTO_NAME = "cri_api_v1"

_GOGO_IMPORT = re.compile(r'^\s*import\s+"github\.com/gogo/protobuf/[^"]*";\s*$', re.M)
_GOGO_FILE_OPTION = re.compile(r"^\s*option\s+\(gogoproto\.[^)]*\)\s*=\s*[^;]*;\s*$", re.M)
_GOGO_FIELD_OPTIONS = re.compile(r"\s*\[\s*\(gogoproto\.[^\]]*\]")


def strip_gogo(proto: str) -> str:
    """The proto without gogo imports, file options and field options."""
    proto = _GOGO_IMPORT.sub("", proto)
    proto = _GOGO_FILE_OPTION.sub("", proto)
    return _GOGO_FIELD_OPTIONS.sub("", proto)


def _download_proto() -> str:
    """api.proto of CRI_API_MODULE@CRI_API_VERSION, from the Go module cache."""
    with tempfile.TemporaryDirectory(prefix="vpa-cri-api-") as scratch:
        env = go_env(Path(scratch))
        go = _go()
        out = run([go, "mod", "download", "-json", f"{CRI_API_MODULE}@{CRI_API_VERSION}"],
                  cwd=Path(scratch), env=env, timeout=300)
    info = json.loads(out)
    if info.get("Error"):
        raise BuildError(f"go mod download {CRI_API_MODULE}@{CRI_API_VERSION}: {info['Error']}")
    return (Path(info["Dir"]) / PROTO_IN_MODULE).read_text()


def _go() -> str:
    try:
        return go_binary()
    except GoToolsError as exc:
        raise BuildError(str(exc)) from None


def _tools_version() -> str:
    try:
        return importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError("grpcio-tools is not installed in this interpreter "
                         f"({sys.executable}); install the e2e extra") from None


def _build(staging: Path) -> None:
    proto = staging / f"{PROTO_NAME}.proto"
    proto.write_text(strip_gogo(_download_proto()))
    run([sys.executable, "-m", "grpc_tools.protoc", f"-I{staging}", f"--python_out={staging}",
         f"--grpc_python_out={staging}", f"--pyi_out={staging}", proto.name],
        cwd=staging, timeout=120)


def stubs_dir() -> Path:
    """The cached dir holding cri_api_v1_pb2(.pyi) and cri_api_v1_pb2_grpc (built if missing)."""
    # Generated code is tied to the protoc bundled with grpcio-tools: key by both versions.
    return cached_entry(f"cri-api-{CRI_API_VERSION}-grpcio-tools-{_tools_version()}", _build)


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot load generated module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the _grpc module imports the _pb2 one by this name
    spec.loader.exec_module(module)
    return module


def load_stubs() -> tuple[ModuleType, ModuleType]:
    """(messages, services) modules of the CRI API."""
    pb2 = f"{PROTO_NAME}_pb2"
    if pb2 in sys.modules and f"{pb2}_grpc" in sys.modules:
        return sys.modules[pb2], sys.modules[f"{pb2}_grpc"]
    directory = stubs_dir()
    messages = _load(pb2, directory / f"{pb2}.py")
    services = _load(f"{pb2}_grpc", directory / f"{pb2}_grpc.py")
    return messages, services
