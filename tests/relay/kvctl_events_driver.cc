// kvctl_events_driver: `kvctl [--run-dir DIR] events tail ...` as a process, for the Python
// tests, until kvctl's own main (tools/) calls the same EventsTailMain.
//
//   kvctl_events_driver [--run-dir DIR] tail [FLAGS]
#include <cstdio>
#include <iostream>
#include <string>

#include "kvctl_events.h"

int main(int argc, char** argv) {
  std::string run_dir = "/run/kvagent";
  int first = 1;
  if (argc > 2 && std::string(argv[1]) == "--run-dir") {
    run_dir = argv[2];
    first = 3;
  }
  if (first >= argc || std::string(argv[first]) != "tail") {
    std::fprintf(stderr, "usage: kvctl_events_driver [--run-dir DIR] tail [FLAGS]\n");
    return 2;
  }
  return kvagent::kvctl::EventsTailMain(argc - first, argv + first, run_dir, std::cout, std::cerr);
}
