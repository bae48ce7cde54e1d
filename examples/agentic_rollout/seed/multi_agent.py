# The multi-agent and monitoring examples of the AgenticRollout design document, as the
# document writes them; only the import lines are kernelflow's. Both call helpers the
# document leaves to the reader (the orchestrator's agent factories, the monitor's
# alerting and report sections): a subclass supplies them (docs/agents.md,
# "AgenticRollout").
from typing import Any, Dict, List

from kernelflow.agentic_rollout import StepType, Trajectory

class AgentOrchestrator:
    """多智能体协作系统"""
    
    def __init__(self, llm_func):
        self.llm_func = llm_func
        self.agents = {
            "researcher": self._create_research_agent(),
            "analyst": self._create_analysis_agent(),
            "writer": self._create_writing_agent()
        }
    
    async def collaborative_report(self, topic: str) -> Dict[str, Any]:
        """协作生成研究报告"""
        results = {}
        
        # 第一阶段：研究收集
        research_trajectory = await self.agents["researcher"].run_trajectory(
            prompt={"content": f"Research topic: {topic}"},
            llm_generate_func=self.llm_func,
            request_id=f"research_{topic}"
        )
        results["research"] = research_trajectory
        
        # 第二阶段：数据分析
        analysis_prompt = {
            "content": f"Analyze the following research data about {topic}",
            "research_data": research_trajectory.get_final_response()
        }
        analysis_trajectory = await self.agents["analyst"].run_trajectory(
            prompt=analysis_prompt,
            llm_generate_func=self.llm_func,
            request_id=f"analysis_{topic}"
        )
        results["analysis"] = analysis_trajectory
        
        # 第三阶段：报告撰写
        writing_prompt = {
            "content": f"Write a comprehensive report on {topic}",
            "research_data": research_trajectory.get_final_response(),
            "analysis_data": analysis_trajectory.get_final_response()
        }
        writing_trajectory = await self.agents["writer"].run_trajectory(
            prompt=writing_prompt,
            llm_generate_func=self.llm_func,
            request_id=f"writing_{topic}"
        )
        results["final_report"] = writing_trajectory
        
        return results


class AgenticRolloutMonitor:
    """智能体性能监控系统"""
    
    def __init__(self):
        self.metrics = {}
        self.alerts = []
    
    async def monitor_trajectory(self, trajectory: Trajectory) -> Dict[str, Any]:
        """监控单个轨迹性能"""
        metrics = {
            "trajectory_id": trajectory.request_id,
            "total_steps": len(trajectory.steps),
            "tool_calls": len(trajectory.get_tool_calls()),
            "completion_status": trajectory.is_completed,
            "error_count": len([s for s in trajectory.steps if "error" in s.metadata]),
            "efficiency_score": self._calculate_efficiency(trajectory)
        }
        
        # 检查异常情况
        alerts = self._check_alerts(metrics)
        if alerts:
            await self._send_alerts(alerts)
        
        return metrics
    
    def _calculate_efficiency(self, trajectory: Trajectory) -> float:
        """计算轨迹效率分数"""
        total_steps = len(trajectory.steps)
        productive_steps = len([
            s for s in trajectory.steps 
            if s.step_type in [StepType.ACTION, StepType.FINAL_ANSWER]
        ])
        return productive_steps / total_steps if total_steps > 0 else 0
    
    async def generate_performance_report(self, trajectories: List[Trajectory]) -> str:
        """生成性能报告"""
        total_trajectories = len(trajectories)
        completed_trajectories = sum(1 for t in trajectories if t.is_completed)
        avg_steps = sum(len(t.steps) for t in trajectories) / total_trajectories
        
        report = f"""
        Performance Report
        ==================
        Total Trajectories: {total_trajectories}
        Completion Rate: {completed_trajectories/total_trajectories*100:.1f}%
        Average Steps: {avg_steps:.1f}
        
        Top Issues:
        {self._analyze_common_issues(trajectories)}
        
        Recommendations:
        {self._generate_recommendations(trajectories)}
        """
        return report
