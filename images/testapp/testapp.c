/* The workload of the real-node tests: prints its arguments and environment (one `env NAME=VALUE` line each, so
 * a test reads what the kubelet and a device plugin gave the container from `kubectl logs`), opens a TCP
 * connection to the `kubernetes` Service when the kubelet named one (proof that pods reach the API server), then
 * waits until SIGTERM or SIGINT. Built static by `cargo xtask images`, so its image needs no userland. */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

extern char **environ;

static void quit(int signal_number) {
    (void)signal_number;
    _exit(0);
}

/* Prints `apiserver HOST:PORT connected` or `apiserver HOST:PORT failed: <reason>`. */
static void probe_apiserver(void) {
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (host == NULL || port == NULL) {
        return;
    }
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(port))};
    const char *failure = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (inet_pton(AF_INET, host, &address.sin_addr) != 1) {
        failure = "not an IPv4 address";
    } else if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) < 0) {
        failure = strerror(errno);
    }
    if (failure != NULL) {
        printf("apiserver %s:%s failed: %s\n", host, port, failure);
    } else {
        printf("apiserver %s:%s connected\n", host, port);
    }
    if (fd >= 0) {
        close(fd);
    }
}

int main(int argc, char **argv) {
    struct sigaction on_quit = {.sa_handler = quit};
    if (sigaction(SIGINT, &on_quit, NULL) < 0 || sigaction(SIGTERM, &on_quit, NULL) < 0) {
        return 1;
    }
    for (int index = 1; index < argc; index++) {
        printf("arg %s\n", argv[index]);
    }
    for (char **entry = environ; *entry != NULL; entry++) {
        printf("env %s\n", *entry);
    }
    fflush(stdout); /* the environment shows even while the probe below waits */
    probe_apiserver();
    printf("testapp: pid %d, waiting\n", (int)getpid());
    fflush(stdout);
    for (;;) {
        pause();
    }
}
