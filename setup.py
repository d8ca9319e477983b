"""Build hook: the wheel carries the gRPC stubs generated from proto/, so an install needs no protoc.

grpcio-tools is a build requirement only (pyproject.toml [build-system]). An editable install (`make setup`)
gets its stubs in the source tree instead, where the Makefile keeps them up to date with the .proto files.
"""

from importlib import resources
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTO_ROOT = Path(__file__).resolve().parent / "proto"
PACKAGE_DOCSTRING = '"""Generated from proto/ragsidecar/v1 at build time; never edited."""\n'


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            generate_stubs(Path(self.build_lib))


def generate_stubs(out: Path) -> None:
    from grpc_tools import protoc

    protos = sorted(str(p) for p in (PROTO_ROOT / "ragsidecar" / "v1").glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}")
    well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    command = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--pyi_out={out}",
        *protos,
    ]
    if protoc.main(command) != 0:
        raise SystemExit("protoc failed to generate the gRPC stubs")
    # A regular package, as the import rules (pyproject.toml [tool.importlinter]) read it.
    (out / "ragsidecar" / "v1" / "__init__.py").write_text(PACKAGE_DOCSTRING)


setup(cmdclass={"build_py": BuildPyWithStubs})
