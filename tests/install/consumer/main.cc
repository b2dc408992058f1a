// A user's program against an installed libtent: tent.hpp (and through it
// tent.h) from the package's include directory, libtent.so through its
// SONAME. Moves 64 KiB from one registered buffer to another over the
// engine's own segment and checks the bytes.
#include <cstdio>
#include <cstring>
#include <vector>

#include "tent.hpp"

int main() {
  try {
    tent::Version v = tent::library_version();
    tent::Version h = tent::header_version();
    if (v.major != h.major || v.minor != h.minor || v.patch != h.patch) {
      std::fprintf(stderr, "consumer: header %u.%u.%u, library %u.%u.%u\n", h.major, h.minor, h.patch, v.major,
                   v.minor, v.patch);
      return 1;
    }
    tent::Engine engine;
    std::vector<unsigned char> src(1 << 16), dst(1 << 16, 0);
    for (size_t i = 0; i < src.size(); i++) {
      src[i] = static_cast<unsigned char>(i * 7 + 1);
    }
    tent::Region rs = engine.register_memory(src.data(), src.size());
    tent::Region rd = engine.register_memory(dst.data(), dst.size());
    tent::Segment self = engine.open_segment(engine.name());
    tent::Outcome out = engine.transfer({tent::write_to(self, tent::remote_address(dst.data()), src.data(), src.size())});
    out.check();
    if (std::memcmp(src.data(), dst.data(), src.size()) != 0) {
      std::fprintf(stderr, "consumer: the bytes differ after the transfer\n");
      return 1;
    }
    std::printf("consumer ok: libtent %u.%u.%u moved %llu bytes\n", v.major, v.minor, v.patch,
                static_cast<unsigned long long>(out.bytes()));
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
