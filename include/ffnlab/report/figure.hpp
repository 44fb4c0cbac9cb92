// Figures: gnuplot (pngcairo) run on a script that reads CSV data written beside it, so that
// every PNG comes with its data for any other tool.
#pragma once

#include <string>

namespace ffnlab {

// Writes DIR/NAME.gp (the script; it must write NAME.png and read its data by relative path),
// runs gnuplot in DIR, and checks that NAME.png exists and is not empty. Throws
// "[figure] NAME: ..." with gnuplot's first error line when it fails.
void render_figure(const std::string& dir, const std::string& name, const std::string& script);

// Whether a gnuplot program is on the PATH.
bool gnuplot_available();

}  // namespace ffnlab
