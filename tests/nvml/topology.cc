// Prints tent_topology_json. Linked with plain `-ltent` and nothing else:
// proof that libtent.so leaves no NVML symbol for the program to resolve.
#include <cstdio>
#include <string>

#include "tent.h"

int main() {
  size_t need = 0;
  if (tent_topology_json(nullptr, 0, &need) != TENT_ERR_BUFFER_TOO_SMALL || need == 0) {
    std::fprintf(stderr, "tent_topology_json: no size: %s\n", tent_last_error());
    return 1;
  }
  std::string buf(need + 1, '\0');
  size_t n = 0;
  if (tent_topology_json(&buf[0], buf.size(), &n) != TENT_OK) {
    std::fprintf(stderr, "tent_topology_json: %s\n", tent_last_error());
    return 1;
  }
  buf.resize(n);
  std::printf("%s\n", buf.c_str());
  return 0;
}
