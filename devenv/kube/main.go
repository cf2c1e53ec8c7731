// Command kube is the development harness's one binary for a one-node Kubernetes on 127.0.0.1:
// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl and etcd, linked
// once from pinned modules (see go.mod). It picks the component from the name it was started
// as (a symlink named after the component) or, when started as "kube", from its first
// argument: `kube kubelet --config=...`. scripts/build-kube.sh builds it; the Python harness
// devenv/rhp_devenv/kube.py runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as the upstream API server and controller manager link

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// components maps a component name to a function running it with os.Args as that component's
// own command line (os.Args[0] is the component's name) and returning the exit code.
var components = map[string]func() int{
	"kube-apiserver": func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":        func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kubectl": func() int {
		_, _ = logs.GlogSetter(kubectl.GetLogVerbosity(os.Args))
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err) // prints the error the kubectl way and exits non-zero
		}
		return 0
	},
	"etcd": func() int {
		etcdmain.Main(os.Args)
		return 0
	},
}

func usage() {
	names := make([]string, 0, len(components))
	for name := range components {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: kube COMPONENT [ARGS...]  (or run it through a symlink named COMPONENT)\ncomponents: %v\n", names)
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok {
		if len(os.Args) < 2 {
			usage()
			os.Exit(2)
		}
		name = os.Args[1]
		if _, ok := components[name]; !ok {
			fmt.Fprintf(os.Stderr, "kube: unknown component %q\n", name)
			usage()
			os.Exit(2)
		}
		// The component sees its own name as argv[0] and only its own arguments after it.
		os.Args = os.Args[1:]
	}
	os.Exit(components[name]())
}
