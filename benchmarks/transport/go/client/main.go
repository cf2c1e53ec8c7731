// Command client is the Go caller of the transport benchmark. It prints one JSON object.
//
//	-mode unary:  -n calls one after another; p50/p99 latency in microseconds
//	-mode conc:   -c callers for -seconds; calls per second
//	-mode stream: -reps bidi streams of -msgs messages each (all sent, all read); p50/p99 ms
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"log"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"rhpbench/rawcodec"
)

func pct(d []float64, p float64) float64 {
	sort.Float64s(d)
	i := int(p * float64(len(d)-1))
	return d[i]
}

func main() {
	addr := flag.String("addr", "", "unix socket path")
	mode := flag.String("mode", "unary", "unary | conc | stream")
	method := flag.String("method", "/bench.Echo/Unary", "full method")
	payloadHex := flag.String("payload", "", "request message, hex")
	n := flag.Int("n", 2000, "unary calls")
	warm := flag.Int("warmup", 200, "warm-up calls")
	conc := flag.Int("c", 16, "concurrent callers")
	seconds := flag.Float64("seconds", 2, "duration of -mode conc")
	msgs := flag.Int("msgs", 1000, "messages per stream")
	reps := flag.Int("reps", 20, "streams")
	flag.Parse()
	payload, err := hex.DecodeString(*payloadHex)
	if err != nil {
		log.Fatal(err)
	}
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", *addr)
	}
	conn, err := grpc.Dial("passthrough:///bench", grpc.WithInsecure(), grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawcodec.Codec{}), grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	call := func() {
		var out []byte
		if err := conn.Invoke(ctx, *method, &payload, &out); err != nil {
			log.Fatal(err)
		}
	}
	for i := 0; i < *warm; i++ {
		call()
	}
	result := map[string]interface{}{"mode": *mode}
	switch *mode {
	case "unary":
		lat := make([]float64, *n)
		start := time.Now()
		for i := range lat {
			t := time.Now()
			call()
			lat[i] = float64(time.Since(t).Nanoseconds()) / 1e3
		}
		result["seconds"] = time.Since(start).Seconds()
		result["p50_us"] = pct(lat, 0.5)
		result["p99_us"] = pct(lat, 0.99)
	case "conc":
		var count int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
		start := time.Now()
		for w := 0; w < *conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					call()
					atomic.AddInt64(&count, 1)
				}
			}()
		}
		wg.Wait()
		result["calls_per_s"] = float64(count) / time.Since(start).Seconds()
	case "stream":
		desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
		lat := make([]float64, *reps)
		for r := range lat {
			t := time.Now()
			st, err := conn.NewStream(ctx, desc, *method)
			if err != nil {
				log.Fatal(err)
			}
			go func() {
				for i := 0; i < *msgs; i++ {
					if err := st.SendMsg(&payload); err != nil {
						log.Fatal(err)
					}
				}
				_ = st.CloseSend()
			}()
			for i := 0; i < *msgs; i++ {
				var out []byte
				if err := st.RecvMsg(&out); err != nil {
					log.Fatal(err)
				}
			}
			lat[r] = float64(time.Since(t).Nanoseconds()) / 1e6
		}
		result["p50_ms"] = pct(lat, 0.5)
		result["p99_ms"] = pct(lat, 0.99)
	}
	if err := json.NewEncoder(os.Stdout).Encode(result); err != nil {
		log.Fatal(err)
	}
}
