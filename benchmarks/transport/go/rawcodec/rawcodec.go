// Package rawcodec is a gRPC codec that moves messages as raw bytes, so the benchmark ends need
// no generated code: the relay under test never looks inside pass-through messages anyway.
package rawcodec

import "fmt"

// Codec marshals *[]byte and []byte as they are.
type Codec struct{}

// Marshal returns the bytes of v.
func (Codec) Marshal(v interface{}) ([]byte, error) {
	switch m := v.(type) {
	case *[]byte:
		return *m, nil
	case []byte:
		return m, nil
	}
	return nil, fmt.Errorf("rawcodec: cannot marshal %T", v)
}

// Unmarshal stores a copy of data in v, which must be a *[]byte.
func (Codec) Unmarshal(data []byte, v interface{}) error {
	m, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawcodec: cannot unmarshal into %T", v)
	}
	*m = append((*m)[:0], data...)
	return nil
}

// Name is "proto", so the content-type stays plain application/grpc.
func (Codec) Name() string { return "proto" }

// String is the name, for the legacy grpc.Codec interface.
func (Codec) String() string { return "proto" }
