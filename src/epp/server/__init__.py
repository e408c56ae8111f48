"""The ext_proc edge: protobuf in, protobuf out; none of it leaks inward."""
