// testkubelet is the kubelet side of the device plugin contract, written on the kubelet's own generated API
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) for end-to-end tests on nodes that have no real kubelet (kwok):
//   - like a starting kubelet, it deletes every socket in the device-plugin directory and serves Registration on
//     kubelet.sock;
//   - for each registered resource it dials the plugin, follows ListAndWatch, and writes the node's capacity (all
//     devices) and allocatable (healthy devices) through the API, as the kubelet's node status does;
//   - for every pod the scheduler binds to its node it asks GetPreferredAllocation, calls Allocate for each
//     container's extended resources, and records the answer in the pod annotation
//     e2e.gpu-operator/device-allocation (the devices, environment and CDI names a runtime would get).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// AllocationAnnotation is where the answer of Allocate is recorded on the pod.
const AllocationAnnotation = "e2e.gpu-operator/device-allocation"

// resource is one registered plugin resource.
type resource struct {
	client  pluginapi.DevicePluginClient
	options *pluginapi.DevicePluginOptions
	// health by device ID, as ListAndWatch last said.
	devices map[string]string
	// pod UID by allocated device ID.
	allocated map[string]types.UID
}

type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir    string
	node   string
	client kubernetes.Interface

	mu        sync.Mutex
	resources map[string]*resource
	pods      map[types.UID]bool
}

// Register accepts a plugin and starts following its device list.
func (k *kubelet) Register(ctx context.Context, request *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if request.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported API version %q", request.Version)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, request.Endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	res := &resource{client: pluginapi.NewDevicePluginClient(conn), options: request.Options,
		devices: map[string]string{}, allocated: map[string]types.UID{}}
	k.mu.Lock()
	k.resources[request.ResourceName] = res
	k.mu.Unlock()
	log.Printf("registered %s on %s", request.ResourceName, request.Endpoint)
	go k.listAndWatch(request.ResourceName, res)
	return &pluginapi.Empty{}, nil
}

func (k *kubelet) listAndWatch(name string, res *resource) {
	stream, err := res.client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		log.Printf("ListAndWatch %s: %v", name, err)
		return
	}
	for {
		response, err := stream.Recv()
		if err != nil {
			log.Printf("ListAndWatch %s ended: %v", name, err)
			// As the kubelet does when a plugin goes away: capacity stays, allocatable drops to 0.
			k.mu.Lock()
			for id := range res.devices {
				res.devices[id] = pluginapi.Unhealthy
			}
			k.mu.Unlock()
			k.publish()
			return
		}
		k.mu.Lock()
		res.devices = map[string]string{}
		for _, device := range response.Devices {
			res.devices[device.ID] = device.Health
		}
		k.mu.Unlock()
		k.publish()
	}
}

// publish writes capacity and allocatable of every resource into the node's status.
func (k *kubelet) publish() {
	k.mu.Lock()
	capacity, allocatable := map[string]string{}, map[string]string{}
	for name, res := range k.resources {
		healthy := 0
		for _, health := range res.devices {
			if health == pluginapi.Healthy {
				healthy++
			}
		}
		capacity[name] = fmt.Sprint(len(res.devices))
		allocatable[name] = fmt.Sprint(healthy)
	}
	k.mu.Unlock()
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": allocatable}})
	_, err := k.client.CoreV1().Nodes().PatchStatus(context.Background(), k.node, patch)
	if err != nil {
		log.Printf("node status: %v", err)
		return
	}
	log.Printf("node %s allocatable %v", k.node, allocatable)
}

// admit allocates the extended resources of every container of a pod bound to the node, once.
func (k *kubelet) admit(pod *corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pods[pod.UID] || pod.DeletionTimestamp != nil {
		return
	}
	k.pods[pod.UID] = true
	result := map[string]any{}
	for _, container := range pod.Spec.Containers {
		answers := map[string]any{}
		for name, quantity := range container.Resources.Limits {
			res, ok := k.resources[string(name)]
			if !ok {
				continue
			}
			ids, err := k.allocate(res, pod.UID, int(quantity.Value()))
			if err != nil {
				answers[string(name)] = map[string]any{"error": err.Error()}
				continue
			}
			answers[string(name)] = ids
		}
		result[container.Name] = answers
	}
	value, _ := json.Marshal(result)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AllocationAnnotation: string(value)}}})
	if _, err := k.client.CoreV1().Pods(pod.Namespace).Patch(context.Background(), pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		log.Printf("annotating pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}

// allocate picks devices (the plugin's preference when it offers one) and calls Allocate.
func (k *kubelet) allocate(res *resource, pod types.UID, size int) (map[string]any, error) {
	var available []string
	for id, health := range res.devices {
		if _, taken := res.allocated[id]; !taken && health == pluginapi.Healthy {
			available = append(available, id)
		}
	}
	sort.Strings(available)
	if len(available) < size {
		return nil, fmt.Errorf("only %d devices available, %d requested", len(available), size)
	}
	chosen := available[:size]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res.options != nil && res.options.GetPreferredAllocationAvailable {
		preferred, err := res.client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: available, AllocationSize: int32(size)}},
		})
		if err != nil {
			return nil, err
		}
		chosen = preferred.ContainerResponses[0].DeviceIDs
	}
	response, err := res.client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: chosen}},
	})
	if err != nil {
		return nil, err
	}
	for _, id := range chosen {
		res.allocated[id] = pod
	}
	answer := response.ContainerResponses[0]
	var cdi []string
	for _, device := range answer.CdiDevices {
		cdi = append(cdi, device.Name)
	}
	return map[string]any{"devices": chosen, "envs": answer.Envs, "cdiDevices": cdi, "annotations": answer.Annotations}, nil
}

// release frees the devices of a pod that is gone.
func (k *kubelet) release(pod types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, res := range k.resources {
		for id, owner := range res.allocated {
			if owner == pod {
				delete(res.allocated, id)
			}
		}
	}
}

func (k *kubelet) watchPods() {
	for {
		watcher, err := k.client.CoreV1().Pods("").Watch(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + k.node})
		if err != nil {
			log.Printf("watching pods: %v", err)
			time.Sleep(time.Second)
			continue
		}
		for event := range watcher.ResultChan() {
			pod, ok := event.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if event.Type == watch.Deleted {
				k.release(pod.UID)
			} else {
				k.admit(pod)
			}
		}
	}
}

func main() {
	dir := flag.String("dir", "/var/lib/kubelet/device-plugins", "the device-plugin directory")
	node := flag.String("node", "", "the node this kubelet stands in for")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		log.Fatal(err)
	}
	k := &kubelet{dir: *dir, node: *node, client: kubernetes.NewForConfigOrDie(config),
		resources: map[string]*resource{}, pods: map[types.UID]bool{}}
	// A starting kubelet deletes every socket in the directory; plugins must notice and register again.
	entries, _ := os.ReadDir(*dir)
	for _, entry := range entries {
		if strings.HasSuffix(entry.Name(), ".sock") {
			_ = os.Remove(filepath.Join(*dir, entry.Name()))
		}
	}
	listener, err := net.Listen("unix", filepath.Join(*dir, "kubelet.sock"))
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(server, k)
	go k.watchPods()
	// Like the kubelet's node status loop: the status is written again every few seconds, so that another writer
	// (kwok initialising the node) cannot leave it without the extended resources.
	go func() {
		for range time.Tick(5 * time.Second) {
			k.publish()
		}
	}()
	log.Printf("serving Registration on %s for node %s", listener.Addr(), *node)
	log.Fatal(server.Serve(listener))
}
