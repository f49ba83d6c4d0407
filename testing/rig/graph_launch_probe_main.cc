// gtp-graph-launch-probe's entry point (the probe itself is graph_launch_probe.cu).
int graph_launch_probe_main(int argc, char** argv);

int main(int argc, char** argv) { return graph_launch_probe_main(argc, argv); }
