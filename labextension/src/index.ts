/** hpinteract's JupyterLab extension: this module only registers the plugins. */
import { jobsPlugin } from './plugin';

export default [jobsPlugin];
