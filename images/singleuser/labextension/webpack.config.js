// Merged by @jupyter/builder into its bundler configuration (package.json's
// jupyterlab.webpackConfig). Module ids by the order the build meets the modules: the default
// ("deterministic") hashes each module's identifier, and that of the container's entry holds
// the absolute path of lib/index.js, so that the same sources built in another folder gave
// another remoteEntry file. With these the build is the same, byte for byte, wherever it runs.
module.exports = {
  optimization: {
    moduleIds: 'natural'
  }
};
