// Command fake-cri is the container runtime of the end-to-end tests' real kubelets: this machine has no
// container runtime (and no GPU), so the kubelet talks CRI to the fake runtime of k8s.io/cri-client, the one
// kubemark's hollow nodes use. Pods "run" without processes; everything else (admission, the device manager and
// its calls to device plugins, node status, the pod-resources API) is the kubelet's own code.
//
// Every CreateContainer is recorded as one JSON line (pod, container, environment, CDI devices, mounts, device
// nodes), so tests can see exactly what the kubelet passed on from a device plugin's Allocate answer or a DRA
// driver's NodePrepareResources. With --cdi-dir the runtime resolves the CDI devices it is given against the JSON
// specs there, as a CDI-enabled containerd or CRI-O does: the spec's and the device's container edits (environment,
// mounts, device nodes) are applied to the container, and a name no spec defines fails the container.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// createdContainer is one recorded CreateContainer request.
type createdContainer struct {
	Namespace  string            `json:"namespace"`
	Pod        string            `json:"pod"`
	Container  string            `json:"container"`
	Env        map[string]string `json:"env"`
	CDIDevices []string          `json:"cdiDevices"`
	Mounts     map[string]string `json:"mounts"`
	Devices    []string          `json:"devices"`
}

// recordingRuntime is the fake runtime with CreateContainer recorded first.
type recordingRuntime struct {
	*fake.RemoteRuntime
	lock    sync.Mutex
	records *os.File
	cdiDir  string
}

// cdiEdits is the part of a CDI spec's containerEdits the tests look at.
type cdiEdits struct {
	Env         []string `json:"env"`
	DeviceNodes []struct {
		Path string `json:"path"`
	} `json:"deviceNodes"`
	Mounts []struct {
		HostPath      string `json:"hostPath"`
		ContainerPath string `json:"containerPath"`
	} `json:"mounts"`
}

// cdiSpec is a CDI spec file.
type cdiSpec struct {
	Kind           string   `json:"kind"`
	ContainerEdits cdiEdits `json:"containerEdits"`
	Devices        []struct {
		Name           string   `json:"name"`
		ContainerEdits cdiEdits `json:"containerEdits"`
	} `json:"devices"`
}

// apply adds a CDI spec's edits to the record.
func (e cdiEdits) apply(record *createdContainer) {
	for _, env := range e.Env {
		if key, value, ok := strings.Cut(env, "="); ok {
			record.Env[key] = value
		}
	}
	for _, mount := range e.Mounts {
		record.Mounts[mount.ContainerPath] = mount.HostPath
	}
	for _, node := range e.DeviceNodes {
		record.Devices = append(record.Devices, node.Path)
	}
}

// resolveCDI applies the edits of a fully qualified CDI device ("<vendor>/<class>=<name>") from the specs in the
// runtime's CDI directory, read afresh (DRA drivers write a spec per claim just before the container is created).
func (r *recordingRuntime) resolveCDI(id string, record *createdContainer) error {
	kind, name, ok := strings.Cut(id, "=")
	if !ok {
		return fmt.Errorf("CDI device %q is not <vendor>/<class>=<name>", id)
	}
	files, _ := filepath.Glob(filepath.Join(r.cdiDir, "*.json"))
	for _, file := range files {
		bytes, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		var spec cdiSpec
		if json.Unmarshal(bytes, &spec) != nil || spec.Kind != kind {
			continue
		}
		for _, device := range spec.Devices {
			if device.Name == name {
				spec.ContainerEdits.apply(record)
				device.ContainerEdits.apply(record)
				return nil
			}
		}
	}
	return fmt.Errorf("unresolvable CDI devices %s", id)
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	config := req.GetConfig()
	record := createdContainer{
		Namespace: req.GetSandboxConfig().GetMetadata().GetNamespace(),
		Pod:       req.GetSandboxConfig().GetMetadata().GetName(),
		Container: config.GetMetadata().GetName(),
		Env:       map[string]string{},
		Mounts:    map[string]string{},
	}
	for _, env := range config.GetEnvs() {
		record.Env[env.GetKey()] = string(env.GetValue())
	}
	for _, device := range config.GetCDIDevices() {
		record.CDIDevices = append(record.CDIDevices, device.GetName())
		if r.cdiDir != "" {
			if err := r.resolveCDI(device.GetName(), &record); err != nil {
				return nil, err
			}
		}
	}
	for _, mount := range config.GetMounts() {
		record.Mounts[mount.GetContainerPath()] = mount.GetHostPath()
	}
	for _, device := range config.GetDevices() {
		record.Devices = append(record.Devices, device.GetContainerPath())
	}
	line, err := json.Marshal(record)
	if err != nil {
		return nil, err
	}
	r.lock.Lock()
	_, err = r.records.Write(append(line, '\n'))
	r.lock.Unlock()
	if err != nil {
		return nil, err
	}
	created, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	// The fake runtime leaves a container's log path empty, and the kubelet removes a deleted container's log
	// at that path: an empty one resolves against the kubelet's working directory and deletes files there. The
	// path the kubelet asked for (under its pod log directory) is what a real runtime reports.
	r.RuntimeService.Lock()
	if container, ok := r.RuntimeService.Containers[created.GetContainerId()]; ok {
		container.LogPath = filepath.Join(req.GetSandboxConfig().GetLogDirectory(), config.GetLogPath())
	}
	r.RuntimeService.Unlock()
	return created, nil
}

func main() {
	socket := flag.String("socket", "", "the unix socket to serve the CRI on (the kubelet's --container-runtime-endpoint)")
	recordsPath := flag.String("records", "", "the file that receives one JSON line per created container")
	cdiDir := flag.String("cdi-dir", "", "the CDI spec directory CDI devices are resolved from (none: recorded, not resolved)")
	flag.Parse()
	if *socket == "" || *recordsPath == "" {
		log.Fatal("--socket and --records are required")
	}
	records, err := os.OpenFile(*recordsPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatalf("cannot open the records file: %v", err)
	}
	runtime := &recordingRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), records: records, cdiDir: *cdiDir}
	// A pulled image needs a size, or the kubelet refuses to create containers from it.
	runtime.ImageService.SetFakeImageSize(1 << 20)
	// What fake.RemoteRuntime.Start sets before serving: the runtime and its network are ready.
	runtime.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}

	_ = os.Remove(*socket)
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatalf("cannot listen on %s: %v", *socket, err)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, runtime)
	runtimeapi.RegisterImageServiceServer(server, runtime)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	log.Printf("serving the CRI on %s, recording containers in %s", *socket, *recordsPath)
	if err := server.Serve(listener); err != nil {
		log.Fatalf("serving: %v", err)
	}
}
