// Entry point of the `strata` binary (the commands live in the strata_cli library).
#include <malloc.h>

#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"

int main(int argc, char** argv) {
  // Blocks of 64 KiB and more (cache pages, the recall index, archive records, prefill buffers)
  // get their own mappings, so memory a policy releases goes back to the system at once and a
  // growing index does not fragment the heap. With glibc's default, the threshold climbs to the
  // largest block freed so far (up to 32 MiB): a 65k-token VestigeKV cache with its file archive
  // then held 233 MB of freed pages in the heap, and peak RSS was 2.9x its resident bytes.
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  std::vector<std::string> args(argv + 1, argv + argc);
  return strata::cli::RunStrata(args, std::cout, std::cerr);
}
