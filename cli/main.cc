// Entry point of the `strata` binary (the commands live in the strata_cli library).
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return strata::cli::RunStrata(args, std::cout, std::cerr);
}
