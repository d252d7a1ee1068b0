/** Jest for the model and the request helper (ts-jest; JupyterLab's ESM packages are
 * mocked where those modules import them, so nothing needs transpiling but our code). */
module.exports = {
  preset: 'ts-jest',
  testEnvironment: 'node',
  testMatch: ['<rootDir>/test/**/*.test.ts'],
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  }
};
