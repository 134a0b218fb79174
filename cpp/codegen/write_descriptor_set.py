"""Write the KServe v2 / Triton protocol descriptors that tritonclient ships as a FileDescriptorSet.

protoc reads the set with --descriptor_set_in and generates C++ from it, so no .proto file of
another project is copied into this repository.

Usage: python write_descriptor_set.py OUT.pb
"""

import sys

from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2


def main(out_path: str) -> None:
    descriptor_set = descriptor_pb2.FileDescriptorSet()
    # Dependencies first: grpc_service.proto imports model_config.proto.
    for module in (model_config_pb2, service_pb2):
        file_proto = descriptor_set.file.add()
        module.DESCRIPTOR.CopyToProto(file_proto)
    with open(out_path, "wb") as f:
        f.write(descriptor_set.SerializeToString())


if __name__ == "__main__":
    main(sys.argv[1])
