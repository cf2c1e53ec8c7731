// Command echoserver is the Go end of the transport benchmark: a gRPC server on a unix socket
// that answers every method by echoing each request message (unary and streaming alike).
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"

	"google.golang.org/grpc"

	"rhpbench/rawcodec"
)

func echo(_ interface{}, stream grpc.ServerStream) error {
	for {
		var msg []byte
		if err := stream.RecvMsg(&msg); err != nil {
			return nil // io.EOF: the client finished sending
		}
		if err := stream.SendMsg(&msg); err != nil {
			return err
		}
	}
}

func main() {
	addr := flag.String("listen", "", "unix socket path")
	flag.Parse()
	_ = os.Remove(*addr)
	lis, err := net.Listen("unix", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.CustomCodec(rawcodec.Codec{}),
		grpc.UnknownServiceHandler(echo),
		grpc.MaxRecvMsgSize(64<<20),
		grpc.MaxSendMsgSize(64<<20),
	)
	fmt.Println("ready")
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
}
